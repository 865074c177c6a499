//! FIFOs keyed by room (or by lane, for the records waiting for each), each drained by at most
//! one worker. A room's entry exists exactly as long as its worker: [`RoomQueues::push`] creates
//! it (and says a worker must start), and [`RoomQueues::next`] removes it when it finds it
//! empty, so nothing is ever queued to a room without a worker, and nothing per room outlives
//! its use. Only the deliveries' owner task holds them, so they need no lock.

use std::collections::{HashMap, VecDeque};

pub(super) struct RoomQueues<T, K> {
    rooms: HashMap<K, VecDeque<T>>,
}

impl<T, K> Default for RoomQueues<T, K> {
    fn default() -> Self {
        RoomQueues {
            rooms: HashMap::new(),
        }
    }
}

impl<T, K: Eq + std::hash::Hash + Clone> RoomQueues<T, K> {
    /// Queues `item` behind what `room` holds; `true` when the room had no worker, so the caller
    /// must start one (its entry exists from now on).
    pub(super) fn push(&mut self, room: &K, item: T) -> bool {
        match self.rooms.get_mut(room) {
            Some(queue) => {
                queue.push_back(item);
                false
            }
            None => {
                self.rooms.insert(room.clone(), VecDeque::from([item]));
                true
            }
        }
    }

    /// The next item of `room`, for its worker. `None` once the queue is empty: the room's entry
    /// is gone with it, and the worker must end.
    pub(super) fn next(&mut self, room: &K) -> Option<T> {
        let next = self.rooms.get_mut(room).and_then(VecDeque::pop_front);
        if next.is_none() {
            self.rooms.remove(room);
        }
        next
    }

    /// Removes `room` with everything still queued to it, for a worker that ends early.
    pub(super) fn abandon(&mut self, room: &K) -> VecDeque<T> {
        self.rooms.remove(room).unwrap_or_default()
    }

    /// How many rooms have a worker.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.rooms.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room(name: &str) -> (String, String) {
        ("tg".to_owned(), name.to_owned())
    }

    #[test]
    fn a_room_gets_a_worker_on_its_first_item_only_and_keeps_its_order() {
        let mut queues = RoomQueues::default();
        assert!(queues.push(&room("1"), "first"), "no worker yet: start one");
        assert!(
            !queues.push(&room("1"), "second"),
            "its worker takes this too"
        );
        assert!(
            queues.push(&room("2"), "elsewhere"),
            "another room, another worker"
        );
        assert_eq!(queues.next(&room("1")), Some("first"));
        assert_eq!(queues.next(&room("1")), Some("second"));
        assert_eq!(queues.len(), 2);
    }

    #[test]
    fn an_emptied_room_is_gone_with_its_worker_and_the_next_item_starts_another() {
        let mut queues = RoomQueues::default();
        assert!(queues.push(&room("1"), 1));
        assert_eq!(queues.next(&room("1")), Some(1));
        assert!(
            !queues.push(&room("1"), 2),
            "the worker has not found the queue empty yet, so it takes this"
        );
        assert_eq!(queues.next(&room("1")), Some(2));
        assert_eq!(queues.next(&room("1")), None);
        assert_eq!(queues.len(), 0, "nothing is left of the room");
        assert!(
            queues.push(&room("1"), 3),
            "the worker ended: start a new one"
        );
    }

    #[test]
    fn an_abandoned_room_gives_back_what_was_queued_and_is_gone() {
        let mut queues = RoomQueues::default();
        queues.push(&room("1"), 1);
        queues.push(&room("1"), 2);
        assert_eq!(queues.abandon(&room("1")), VecDeque::from([1, 2]));
        assert_eq!(queues.len(), 0);
        assert!(queues.push(&room("1"), 3));
    }

    #[test]
    fn many_rooms_come_and_go_without_leaving_entries() {
        let mut queues = RoomQueues::default();
        for n in 0..1000 {
            let key = room(&n.to_string());
            assert!(queues.push(&key, n));
            assert_eq!(queues.next(&key), Some(n));
            assert_eq!(queues.next(&key), None);
        }
        assert_eq!(queues.len(), 0);
    }
}
